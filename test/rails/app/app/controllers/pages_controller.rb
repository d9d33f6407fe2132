# frozen_string_literal: true

class PagesController < ApplicationController
  def show
  end

  def turbo
  end

  def feed
    render layout: "feed"
  end

  # A session-based sign-in, as an app without Devise has it.
  def login
    session[:user_id] = Integer(params[:user_id])
    redirect_to root_path
  end
end
